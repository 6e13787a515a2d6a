"""Host-side verification: the equation registry, its checks and the ``gma-ref verify`` report.

Unlike the rest of :mod:`gma_ref`, this subpackage is *verification* code: its
oracles are deliberately independent computations written with NumPy and
SciPy (explicit loops, ``scipy.stats``, finite differences) on the host. The
code under test runs in whatever namespace is chosen (``--namespace``), and
results are moved back to NumPy for comparison.
"""

from .registry import REGISTRY, Check, Context, all_checks, coverage_markdown, register
from .report import Result, format_report, run_checks, verify

__all__ = [
    "REGISTRY",
    "Check",
    "Context",
    "Result",
    "all_checks",
    "coverage_markdown",
    "format_report",
    "register",
    "run_checks",
    "verify",
]
