"""Measure the error distribution of a correct implementation: how the tolerance table was derived.

:func:`calibrate` runs an implementation over the default cases plus ``n_cases``
generated ones with τ = 1, so every error figure comes back in units of
ν = u_store + u_acc·κ + t_store·λ (:mod:`gma_ref.testing.core.compare`). The
calibrated τ in :data:`~gma_ref.testing.core.compare.TOLERANCES` is a multiple
(8× to 16×, rounded up to a power of two) of the largest normalised error seen
over the correct implementations; ``examples/calibrate_tolerances.py``
regenerates the table printed in docs/oracle/metric-and-tolerances.md. The figures include the
granularity allowance G (:mod:`gma_ref.testing.core.compare`) at the multiple in use,
:data:`~gma_ref.testing.core.compare.GRAIN_MULTIPLE`; that multiple is calibrated
separately, on the correct kernels of :mod:`gma_ref.testing.calibration.rounding_family`
(``examples/calibrate_tolerances.py --family``), since G matters only where the
values reach the granularity of floating point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cases.sets import VARIANTS, default_cases, default_layer_cases, generate_cases, generate_layer_cases, with_gate
from ..core.case_runner import evaluate_case, resolve_vjp
from ..core.compare import Tolerance
from ..core.long import generate_long_cases, long_cases
from ..declaration import Declaration, declaration_of

__all__ = ["Calibration", "calibrate", "calibrate_long"]


@dataclass
class Calibration:
    """Normalised error figures (error / ν) of one implementation and dtype.

    ``norm``/``elem`` map tensor names to the list of per-case values;
    ``failures`` lists contract failures (which calibration must not have);
    ``skipped`` the cases too ill-conditioned for the dtype (ν > NU_MAX).
    """

    implementation: str
    dtype: str
    n_cases: int
    norm: dict[str, list[float]] = field(default_factory=dict)
    elem: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def max_norm(self) -> float:
        """Largest normalised norm error over all tensors and cases."""
        return max((max(v) for v in self.norm.values() if v), default=0.0)

    def max_elem(self) -> float:
        """Largest normalised element error over all tensors and cases."""
        return max((max(v) for v in self.elem.values() if v), default=0.0)

    def quantile(self, which: str, q: float) -> float:
        """The ``q`` quantile of all normalised ``which`` (``'norm'``/``'elem'``) values."""
        import numpy as np

        vals = [x for v in getattr(self, which).values() for x in v]
        return float(np.quantile(vals, q)) if vals else 0.0

    def suggested(self, multiple: float = 8.0) -> Tolerance:
        """τ = ``multiple`` × the observed maximum, rounded up to a power of two."""
        def up(x: float) -> float:
            return 2.0 ** math.ceil(math.log2(max(x * multiple, 1.0)))

        return Tolerance(norm=up(self.max_norm()), elem=up(self.max_elem()))

    def summary(self) -> str:
        """One line per tensor: max and median of both figures."""
        import numpy as np

        lines = [f"{self.implementation} {self.dtype}: {self.n_cases} cases"]
        for t in self.norm:
            n, e = np.asarray(self.norm[t]), np.asarray(self.elem[t])
            lines.append(f"  {t:<15} norm max {n.max():8.3g} median {np.median(n):8.3g}   "
                         f"elem max {e.max():8.3g} median {np.median(e):8.3g}")
        lines.append(f"  overall norm max {self.max_norm():.3g}, elem max {self.max_elem():.3g}; "
                     f"failures: {len(self.failures)}; skipped (ill-conditioned): {len(self.skipped)}")
        return "\n".join(lines)


def calibrate(
    impl: Callable[..., Any],
    dtype: str,
    *,
    n_cases: int = 200,
    seed: int = 0,
    declaration: Declaration | None = None,
    vjp: Callable[..., Any] | None = None,
    variants: Sequence[str] = VARIANTS,
    device: str = "cpu",
    grad: bool = True,
    mode: str | None = None,
) -> Calibration:
    """Normalised errors of ``impl`` at ``dtype`` over the default cases plus ``n_cases`` generated ones.

    ``impl`` must be a *correct* implementation; a failed contract check is
    recorded in :attr:`Calibration.failures`. ``mode='layer'`` (default: the
    declared mode) uses the layer cases and the layer reference.
    """
    decl = declaration or declaration_of(impl) or Declaration(dtypes=(dtype,))
    the_vjp = resolve_vjp(impl, decl, vjp)[0] if grad else None
    layer = (mode or decl.mode) == "layer"
    defaults, generate = (default_layer_cases, generate_layer_cases) if layer else (default_cases, generate_cases)
    cases = defaults(tuple(variants), dtype=dtype, seed=seed)
    cases += generate(n_cases, variants=tuple(variants), dtype=dtype, seed=seed + 1)
    if layer:  # the declared output gate (None: ungated)
        cases = [with_gate(c, decl.gate) for c in cases]
    return _calibrate_cases(impl, cases, decl, the_vjp, dtype, device)


def _calibrate_cases(impl: Callable[..., Any], cases: list[Any], decl: Declaration, vjp: Any, dtype: str,
                     device: str = "cpu") -> Calibration:
    """Every case evaluated with τ = 1: the errors in units of ν, the skipped and the failed contract checks."""
    cal = Calibration(getattr(impl, "__name__", repr(impl)), dtype, len(cases))
    unit = Tolerance(1.0, 1.0)
    for case in cases:
        outcome = evaluate_case(impl, case, decl, vjp=vjp, device=device, contract=False, tolerance=unit)
        if outcome.not_checkable is not None:
            cal.skipped.append(case.case_id)
            continue
        for r in outcome.results:
            if r.metric in ("norm", "elem"):
                getattr(cal, r.metric).setdefault(r.tensor, []).append(r.value / r.threshold)
            elif not r.passed:
                cal.failures.append(f"{r.case_id} {r.check} {r.tensor} {r.metric} {r.detail}")
    return cal


def calibrate_long(impl: Callable[..., Any], dtype: str, *, n_max: int = 131072, seeds: tuple[int, ...] = (0,),
                   grad: bool = True,
                   variants: tuple[str, ...] = VARIANTS, declaration: Declaration | None = None, n_generated: int = 0,
                   n_hi: int = 16384) -> Calibration:
    """Normalised errors (error / ν_long) of a correct ``impl`` over long cases, with τ = 1.

    The cases: :func:`~gma_ref.testing.core.long.long_cases` of each seed plus ``n_generated``
    :func:`~gma_ref.testing.core.long.generate_long_cases` (N up to ``n_hi``). The long-mode counterpart of
    :func:`gma_ref.testing.calibration.measure.calibrate`; returns its :class:`Calibration`.
    """
    decl = declaration or declaration_of(impl) or Declaration(dtypes=(dtype,))
    the_vjp = resolve_vjp(impl, decl, None)[0] if grad and decl.grad else None
    cases = [c for s in seeds for c in long_cases(variants, dtype=dtype, seed=s, n_max=n_max)]
    cases += generate_long_cases(n_generated, variants=variants, dtype=dtype, seed=seeds[0] + 1, n_hi=n_hi)
    return _calibrate_cases(impl, cases, decl, the_vjp, dtype)
