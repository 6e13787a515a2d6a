"""How a candidate is called: framework conversion, one guarded call, the worker process.

:mod:`~gma_ref.testing.calling.capture` (what a call prints), :mod:`~gma_ref.testing.calling.buffers`
(arrays as plain bytes), :mod:`~gma_ref.testing.calling.probes` (a framework's arithmetic),
:mod:`~gma_ref.testing.calling.adapters` (framework conversion and VJP adapters),
:mod:`~gma_ref.testing.calling.calls` (one guarded call), :mod:`~gma_ref.testing.calling.wire` (the
messages between the oracle and its worker), :mod:`~gma_ref.testing.calling.worker` (the worker process,
the candidate's side) and :mod:`~gma_ref.testing.calling.isolation` (the oracle's handle on it).
Of the oracle, these import only the vocabulary and the declaration.
"""

__all__: list[str] = []
