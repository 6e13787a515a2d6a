"""Judging one case: the float64 reference, the condition factors, the metric and the verdict.

:mod:`~gma_ref.testing.core.conditioning` (κ and λ), :mod:`~gma_ref.testing.core.reference` (the
float64 reference of a short or layer case), :mod:`~gma_ref.testing.core.compare` (the metric and the
tolerances), :mod:`~gma_ref.testing.core.long` (long cases and their O(N)-memory reference),
:mod:`~gma_ref.testing.core.report` with :mod:`~gma_ref.testing.core.diagnosis` and
:mod:`~gma_ref.testing.core.html_report` (the verdict and its presentations) and
:mod:`~gma_ref.testing.core.case_runner` (one case checked). The reference evaluates the reader's
functions of :mod:`gma_ref` only, never the fast path it may be asked to judge.
"""

__all__: list[str] = []
