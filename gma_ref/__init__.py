"""gma-ref: reference implementation and executable specification of Gaussian Mixture Attention.

Every equation of the paper (arXiv 2606.18283) has one function; every
operation has its hand-written backward next to it. Array code runs on any
array-API namespace (NumPy, CuPy, PyTorch, array_api_strict). Importing this
package never imports CuPy or PyTorch.

Modules, in the order of the paper:

* :mod:`gma_ref.mixture` — Eqs. 13–15, 55: σ² from ω, π from α.
* :mod:`gma_ref.posterior` — Eqs. 2, 3, 16, 50, 51: scores and the responsibilities Γ.
* :mod:`gma_ref.bidirectional` — Eqs. 5–8, App. E.4: write/read, cross-attention.
* :mod:`gma_ref.induced` — Eqs. 9–11, 23, App. C: the induced affinity and weights, slots, read weights.
* :mod:`gma_ref.causal` — Eqs. 6b, 8b, 9b, 10b: prefix, streaming and chunked causal GMA.
* :mod:`gma_ref.attention` — the full pipeline from routing vectors, with all gradients.
* :mod:`gma_ref.fast` — the same pipeline with the same arguments, reorganised for speed (token blocks, threads).
* :mod:`gma_ref.layer` — Eq. 4 and footnote 18: the multi-head layer.

The package exports what a reader of the paper needs (``gma_ref.__all__``, pinned by
``tests/project/test_public_api.py``): the parameterisation (Eqs. 14, 15), the responsibilities
(Eqs. 3, 16), the write and read (Eqs. 5–7), the induced weights (Eqs. 9–11), the three causal
forms (Eq. 8b), the pipeline and the layer with their backward passes, and their named results.
Everything else — the local backward of each step, the helpers of the diagnostics, the aliases —
is imported from its module (``gma_ref.posterior.scores_backward``).

One convention for every backward pass (``docs/architecture.md``, "The backward convention";
checked by ``tests/across_modules/test_backward_convention.py``): ``f_backward`` takes f's required arguments in f's
order, then the cotangent of f's output (``d_out``; one ``d_<output>`` per output when f returns
several), then keyword-only ``saved=`` where the forward's work can be reused and every other
parameter of f with f's names and defaults. It validates them as f does and returns one named
result whose fields are ``d_<input>`` for f's array inputs, in f's order, each of its input's
shape (:class:`GMAGrad`, :class:`~gma_ref.causal.CausalGrad`, :class:`AttentionGrad`,
:class:`LayerGrad`, …). Every causal form takes ``state=`` and returns ``(out, state)`` only with
``return_state=True``; :func:`gma_attention` returns ``(out, saved)`` (:class:`AttentionSaved`,
for ``gma_attention_backward(..., saved=)``) only with ``return_saved=True``.
"""

from ._array import DEFAULT_MAX_BYTES
from .attention import AttentionGrad, AttentionSaved, gma_attention, gma_attention_backward
from .bidirectional import GMAGrad, gma_bidirectional, gma_bidirectional_backward, read_memory, write_memory
from .causal import CausalState, gma_causal_chunked, gma_causal_prefix, gma_causal_streaming
from .induced import affinity, attention_weights, gma_materialized
from .layer import GMALayerParams, LayerGrad, gma_layer, gma_layer_backward, init_layer_params
from .mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA, log_priors_from_logits, variances_from_omega
from .posterior import responsibilities, scores

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_EPS_SIGMA",
    "AttentionGrad",
    "AttentionSaved",
    "CausalState",
    "GMAGrad",
    "GMALayerParams",
    "LayerGrad",
    "affinity",
    "attention_weights",
    "gma_attention",
    "gma_attention_backward",
    "gma_bidirectional",
    "gma_bidirectional_backward",
    "gma_causal_chunked",
    "gma_causal_prefix",
    "gma_causal_streaming",
    "gma_layer",
    "gma_layer_backward",
    "gma_materialized",
    "init_layer_params",
    "log_priors_from_logits",
    "read_memory",
    "responsibilities",
    "scores",
    "variances_from_omega",
    "write_memory",
]
