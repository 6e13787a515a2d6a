"""Declared properties confirmed by the candidate's own behaviour: a fixed ε (:func:`confirm_fixed_eps`).

A :class:`~gma_ref.testing.declaration.Declaration` with ``eps=ε_d`` makes the harness run every case at
ε_d, so a wrong claim would go unseen: a kernel built with another ε fails only the ``tiny_eps`` cases,
with no word about the declaration, and a kernel that follows the ε it is passed narrows the check to
one ε for nothing. The confirmation runs the candidate on one small ``tiny_eps`` case
(:func:`eps_confirmation_case`: one query whose read mass u is about 0.3 ε_d) through the same
machinery as the cases (in its worker when isolated), twice: at ε_d and at ε_alt = 1000 ε_d (ε_d / 1000
for ε_d > 1e-3). Row i of the output is n_i / (u_i + ε) for every variant, its direction independent of
ε; so the norm of a returned row gives the ε it was computed with, ε̂ = ‖n_i‖ / ‖out_i‖ − u_i, with u_i
and ‖n_i‖ from the float64 reference on the candidate's rounded inputs.

A kernel with a fixed ε_d returns, at ε_d, the reference row of ε_d, and at ε_alt either refuses the
call (raises) or returns that same row. Failures name the field: the output at ε_d is that of another
ε (a fit over every row confirms that ε alone explains it), the output at ε_alt follows ε_alt, or it is
neither. Where the outputs cannot decide (no row depends on ε beyond the dtype's noise, the output is
wrong in ways no ε explains, the call at ε_d raises), the confirmation is listed as not done
(:class:`~gma_ref.testing.core.case_runner.Unconfirmed`); the cases report the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..calling.adapters import reference_namespace, to_reference
from ..calling.calls import attempt, call_impl, failure_kind, split_result
from ..cases.sets import Case, constrain_case
from ..core.case_runner import CaseOutcome, Unconfirmed, prepare_run
from ..core.compare import NU_MAX, TF32_TOLERANCE, TOLERANCES, Tolerance, unit_scale
from ..core.conditioning import mass_seen
from ..core.report import CheckResult
from ..declaration import Declaration
from ..names import INPUT_NAMES

__all__ = ["EPS_CHECK_ID", "TF32_CHECK_ID", "eps_confirmation_case", "confirm_fixed_eps", "alternative_eps"]

#: The case id of the fixed-ε confirmation's result in a report.
EPS_CHECK_ID = "declared-eps"

#: The case id of the check that a declared ``tf32=True`` agrees with the probe of the framework
#: (:func:`~gma_ref.testing.calling.probes.probe_tf32_products`; made by :func:`gma_ref.testing.harness.runner.check`).
TF32_CHECK_ID = "declared-tf32"


def alternative_eps(eps: float) -> float:
    """The other ε the confirmation passes: 1000 ε, or ε / 1000 when ε > 1e-3 (no output row can then underflow)."""
    return eps * 1e3 if eps <= 1e-3 else eps * 1e-3


def eps_confirmation_case(decl: Declaration, variants: tuple[str, ...], dtype: str) -> tuple[Case | None, str]:
    """The small ``tiny_eps`` case the fixed ε of ``decl`` is confirmed on, within its declared sizes.

    Bidirectional when that variant is checked, else the first of ``variants``; B = H = 1, N = 8, K = 4,
    d_r = d_v = 8 before the declared multiples and limits. Returns ``(case, '')``, or ``(None, why)``
    when the declaration leaves no case whose read mass can be placed near ε (K = 1 only).
    """
    variant = "bidirectional" if "bidirectional" in variants else variants[0]
    case = Case(variant, 1, 1, 8, 9 if variant == "cross" else 8, 4, 8, 8, dtype=dtype, regime="tiny_eps",
                eps=1e-12, seed=7)
    new, _ = constrain_case(case, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple,
                            n_max=decl.n_max, k_multiple=decl.k_multiple, k_max=decl.k_max,
                            d_multiple=decl.d_multiple, d_max=decl.d_max, chunked=decl.accepts_chunk_size)
    if new.n_components < 2:
        return None, f"k_max = {decl.k_max} admits K = 1 only: no read mass can be placed near eps"
    return new, ""


@dataclass
class _Rows:
    """What decides ε, per output row (flattened over B, H, N_q): the read mass u and ‖n‖ = ‖R_i‖ (u + ε_d)."""

    u: Any
    n: Any
    valid: Any  # rows whose reference is finite and nonzero
    star: int  # the row whose output depends most on ε
    eta: float  # the relative noise a correct row may carry (the case's elementwise bound)

    def log_ratio(self, norms: Any, eps: float) -> Any:
        """log(‖out_i‖ / ‖R_i(ε)‖), with ‖R_i(ε)‖ = ‖n_i‖ / (u_i + ε)."""
        import numpy as np

        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(norms * (self.u + eps) / self.n)

    def slack(self, eps: float) -> Any:
        """The allowance of each row at ε: the noise, or half the change a factor 2 in ε makes, the larger."""
        import numpy as np

        u = self.u
        half = 0.5 * np.minimum(np.log((u + 2 * eps) / (u + eps)), np.log((u + eps) / (u + eps / 2)))
        return np.maximum(self.eta, half)

    def agrees(self, norms: Any, eps: float) -> bool:
        """Row :attr:`star` of an output with row norms ``norms`` is that of ε (within :meth:`slack`)."""
        r = self.log_ratio(norms, eps)[self.star]
        return bool(abs(r) <= self.slack(eps)[self.star])

    def fitted_eps(self, norms: Any) -> float | None:
        """The ε that row :attr:`star` was computed with, if that ε explains every row (``None`` if none does)."""
        import numpy as np

        eps = max(float(self.n[self.star] / norms[self.star] - self.u[self.star]), 0.0)
        if not math.isfinite(eps):
            return None
        r = self.log_ratio(norms, eps)
        ok = np.abs(r) <= 2 * self.slack(eps)
        return eps if bool(np.all(ok | ~self.valid)) else None


def _to_host(a: Any) -> Any:
    """A float64 host (NumPy) copy of an array of the reference namespace (CuPy's by ``.get()``)."""
    import numpy as np

    return np.asarray(a.get() if type(a).__module__.startswith("cupy") else a, dtype=np.float64)


def _row_norms(a: Any) -> Any:
    """‖row‖₂ of a host array ``(..., N, d)`` flattened to ``(rows,)``, scaled first (no underflow)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64).reshape(-1, a.shape[-1])
    m = np.max(np.abs(a), axis=-1)
    safe = np.where(m > 0, m, 1.0)[:, None]
    return m * np.sqrt(np.sum((a / safe) ** 2, axis=-1))


def _rows(xp: Any, run: Any, eps: float, eta: float) -> _Rows | None:
    """:class:`_Rows` of a prepared run (``None`` when no row of the reference output is nonzero)."""
    import numpy as np

    from ...mixture import log_priors_from_logits, variances_from_omega
    from ...posterior import responsibilities

    inp = {n: to_reference(run.cand[n], xp) for n in INPUT_NAMES}
    var = variances_from_omega(inp["omega"], run.case.eps_sigma, check_finite=False)
    lp = log_priors_from_logits(inp["prior_logits"], check_finite=False)
    gq = responsibilities(inp["q"], inp["means"], var, lp, check_finite=False)
    gk = responsibilities(inp["k"], inp["means"], var, lp, check_finite=False)
    u = np.asarray(_to_host(xp.sum(gq * mass_seen(xp, gk, run.case.causal), axis=-1)), dtype=np.float64).reshape(-1)
    n = _row_norms(_to_host(run.ref.tensors["out"])) * (u + eps)
    valid = np.isfinite(n) & (n > 0)
    if not bool(np.any(valid)):
        return None
    star = int(np.argmax(np.where(valid, eps / (u + eps), -1.0)))
    return _Rows(u, np.where(valid, n, 1.0), valid, star, eta)


def confirm_fixed_eps(impl: Callable[..., Any], case: Case, declaration: Declaration, *, device: str = "cpu",
                      xp: Any = None, tolerance: Tolerance | None = None, full_traceback: bool = False,
                      **_: Any) -> CaseOutcome:
    """Confirm ``declaration.eps`` on ``case`` (:func:`eps_confirmation_case`); its :class:`CaseOutcome`.

    One result (case id :data:`EPS_CHECK_ID`, check ``'declaration'``, tensor ``'eps'``, metric ``'fixed'``,
    value: the ε the output at ε_d was computed with, ε_d itself where it agrees), or :class:`Unconfirmed`
    with the reason. Called like :func:`~gma_ref.testing.core.case_runner.evaluate_case` (the other options,
    ``vjp`` and ``contract`` among them, are ignored: two forward calls only). Raises ``ValueError`` when
    ``declaration.eps`` is ``None``.
    """
    eps = declaration.eps
    if eps is None:
        raise ValueError("confirm_fixed_eps needs a declaration with a fixed eps, got eps = None")
    xp = reference_namespace(device) if xp is None else xp
    run = prepare_run(impl, case, declaration, None, device, xp, tolerance, full_traceback, None)
    nu = unit_scale(case.dtype, run.ref.kappa, run.ref.read_condition, 0.0, declaration.flush_subnormals,
                    declaration.tf32)
    if nu > NU_MAX:
        return _unconfirmed(f"the confirmation case is ill-conditioned at {case.dtype} (nu = {nu:.3g})")
    tf32 = declaration.tf32 and case.dtype == "float32"
    eta = min((tolerance or (TF32_TOLERANCE if tf32 else TOLERANCES[case.dtype])).elem * nu, 0.5)
    rows = _rows(xp, run, eps, eta)
    if rows is None:
        return _unconfirmed("the reference output of the confirmation case is zero")
    out, exc = _call(impl, run, eps)
    if exc is not None:
        return _unconfirmed(f"the call at eps = {eps:g} failed ({failure_kind(exc)[1]}); the cases show it")
    return _judge(case, rows, eps, out, lambda: _call(impl, run, alternative_eps(eps)))


def _call(impl: Callable[..., Any], run: Any, eps: float) -> tuple[Any, BaseException | None]:
    """The row norms of the candidate's output at ``eps`` on the prepared inputs, or what the call raised."""
    opts = dict(run.opts, eps=eps)
    result, exc = attempt(lambda: split_result(call_impl(impl, run.cand, opts, run.names), run.returns_state))
    if exc is not None:
        return None, exc
    return attempt(lambda: _row_norms(_to_host(to_reference(result[0], run.xp))))


def _judge(case: Case, rows: _Rows, eps: float, norms: Any, call_alt: Callable[[], tuple[Any, Any]]
           ) -> CaseOutcome:
    """The verdict from the row norms at ε_d and (called only when those agree with ε_d) at ε_alt."""
    said = f"Declaration.eps = {eps:g} declares the kernel's fixed eps"
    where = f"(case {case.case_id}, output row {rows.star}, read mass u = {float(rows.u[rows.star]):.3g})"
    if not rows.agrees(norms, eps):
        seen = rows.fitted_eps(norms)
        if seen is None:
            return _unconfirmed(f"the output at eps = {eps:g} is not that of any eps {where}: what is wrong "
                                "is not eps alone (the cases show it)")
        return _result(False, seen, f"{said}, but the output at eps = {eps:g} is that of eps ~ {seen:.2g} {where}: "
                       "the kernel is built with another eps; declare that one")
    alt = alternative_eps(eps)
    alt_norms, exc = call_alt()
    if exc is not None:
        return _result(True, eps, f"confirmed: the output at eps = {eps:g} is that eps's, and eps = {alt:g} is "
                       f"refused ({failure_kind(exc)[1][:160]})")
    if rows.agrees(rows.n / (rows.u + alt), eps):
        return _result(True, eps, f"the output at eps = {eps:g} is that eps's; eps = {alt:g} would change this "
                       "case by less than its noise, so ignoring the eps passed was not tested")
    if rows.agrees(alt_norms, eps):
        return _result(True, eps, f"confirmed: the output at eps = {eps:g} is that eps's, and eps = {alt:g} "
                       "passed changes nothing (the kernel's eps is fixed)")
    if rows.agrees(alt_norms, alt):
        return _result(False, eps, f"{said}, but the output follows the eps passed: eps = {alt:g} gave the output "
                       f"of eps = {alt:g} {where}. Its eps is not fixed: declare eps=None and every case is "
                       "checked at its own eps")
    seen = rows.fitted_eps(alt_norms)
    what = f"that of eps ~ {seen:.2g}" if seen is not None else "that of no single eps"
    return _result(False, eps, f"{said}, but with eps = {alt:g} passed the output is {what}, neither the declared "
                   f"eps's nor the one passed {where}")


def _result(passed: bool, seen: float, detail: str) -> CaseOutcome:
    return CaseOutcome(EPS_CHECK_ID, [CheckResult(EPS_CHECK_ID, "declaration", "eps", "fixed", seen, None, passed,
                                                  detail=detail)], None)


def _unconfirmed(why: str) -> CaseOutcome:
    return CaseOutcome(EPS_CHECK_ID, [], None, Unconfirmed(EPS_CHECK_ID, f"not confirmed: {why}"))
