"""What is checked: the seeded case sets and how they are built.

:mod:`~gma_ref.testing.cases.sets` (the short and layer cases, the default set),
:mod:`~gma_ref.testing.cases.covering` (pairwise covering arrays of case axes),
:mod:`~gma_ref.testing.cases.tails` (sizes leaving every tail after a tile) and
:mod:`~gma_ref.testing.cases.power` (the default set's detection power against the fault model).
These import only the vocabulary (:mod:`~gma_ref.testing.names`).
"""

__all__: list[str] = []
