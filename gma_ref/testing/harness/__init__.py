"""Running a whole check: case after case, in a worker process, within bounds, from every entry point.

:mod:`~gma_ref.testing.harness.runner` (:func:`~gma_ref.testing.check`, ``assert_conforms``),
:mod:`~gma_ref.testing.harness.options` (its options grouped: :class:`~gma_ref.testing.CaseSet`,
:class:`~gma_ref.testing.RunOptions`),
:mod:`~gma_ref.testing.harness.placement` (where a candidate passed as an object runs),
:mod:`~gma_ref.testing.harness.bounds` (when a run stops), :mod:`~gma_ref.testing.harness.repro`
(shrinking and case files), :mod:`~gma_ref.testing.harness.explore` (the search beyond the case set),
:mod:`~gma_ref.testing.harness.scaling` (the complexity check), :mod:`~gma_ref.testing.harness.declared`
(declared properties confirmed), :mod:`~gma_ref.testing.harness.assertions` (``assert_gma_close``),
:mod:`~gma_ref.testing.harness.pytest_plugin` and :mod:`~gma_ref.testing.harness.triton_interpreter`.
"""

__all__: list[str] = []
