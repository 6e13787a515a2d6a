"""The fast path: the pipeline of :mod:`gma_ref.attention` with the same arguments and results, faster.

:func:`gma_attention` and :func:`gma_attention_backward` take exactly the arguments of
:func:`gma_ref.attention.gma_attention` and :func:`gma_ref.attention.gma_attention_backward`, raise
the same errors and return the same results to rounding; the tests hold them to the reader's
functions in every regime (``tests/fast``). Inside, the work is reorganised for speed, one idea a module:

* :mod:`gma_ref.fast.blocks` — token blocks on threads, BLAS held to one thread meanwhile;
* :mod:`gma_ref.fast.matmul_scores` — the scores by matrix products, with a rounding guard (Eq. 50);
* :mod:`gma_ref.fast.latent` — the latent form fused with the responsibilities, forward and backward;
* :mod:`gma_ref.fast.causal_batched` — the chunked causal form with its chunks' products batched;
* :mod:`gma_ref.fast.prechecks` — the saved arrays' value checks in one pass;
* :mod:`gma_ref.fast.attention` — the entry that puts them together.
"""

from .attention import gma_attention, gma_attention_backward

__all__ = ["gma_attention", "gma_attention_backward"]
