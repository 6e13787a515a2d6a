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
* :mod:`gma_ref.layer` — Eq. 4 and footnote 18: the multi-head layer.

Every public function is also importable from the package itself:
``gma_ref.responsibilities`` (Eq. 3) and ``gma_ref.affinity`` (Eq. 11) are
functions; no module shares a name with a function.

One convention throughout: every backward pass takes the forward's arguments
then the cotangent (``d_out``; keyword-only in :func:`gma_layer_backward`),
validates both as the forward does, and returns one named result per kind of
operation (:class:`GMAGrad` for every form of the read/write core,
:class:`AttentionGrad`, :class:`LayerGrad`, :class:`ScoresGrad`, :class:`ReadGrad`).
Every causal form takes ``state=`` and returns ``(out, state)`` only with
``return_state=True``; likewise :func:`gma_attention` returns ``(out, residuals)``
(:class:`AttentionResiduals`, for :func:`gma_attention_backward` to reuse) only with
``return_residuals=True``.
"""

from ._array import DEFAULT_MAX_BYTES
from .attention import FORMS, AttentionGrad, AttentionResiduals, gma_attention, gma_attention_backward
from .bidirectional import (
    GMAGrad,
    ReadGrad,
    gma_bidirectional,
    gma_bidirectional_backward,
    gma_cross,
    gma_cross_backward,
    query_mass,
    read_memory,
    read_memory_backward,
    write_memory,
    write_memory_backward,
)
from .causal import (
    CausalState,
    causal_step,
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
    initial_causal_state,
)
from .induced import (
    affinity,
    attention_weights,
    gma_materialized,
    gma_materialized_backward,
    memory_slots,
    read_weights,
)
from .layer import GMALayerParams, LayerGrad, gma_layer, gma_layer_backward, init_layer_params
from .mixture import (
    DEFAULT_EPS,
    DEFAULT_EPS_SIGMA,
    log_priors_from_logits,
    log_priors_from_logits_backward,
    omega_from_variances,
    priors_from_logits,
    sigmoid,
    variances_from_omega,
    variances_from_omega_backward,
)
from .posterior import (
    ScoresGrad,
    log_gaussian_density,
    log_softmax_backward,
    responsibilities,
    responsibilities_backward,
    scores,
    scores_backward,
    softmax_backward,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_EPS_SIGMA",
    "FORMS",
    "AttentionGrad",
    "AttentionResiduals",
    "CausalState",
    "GMAGrad",
    "GMALayerParams",
    "LayerGrad",
    "ReadGrad",
    "ScoresGrad",
    "affinity",
    "attention_weights",
    "causal_step",
    "gma_attention",
    "gma_attention_backward",
    "gma_bidirectional",
    "gma_bidirectional_backward",
    "gma_causal_chunked",
    "gma_causal_chunked_backward",
    "gma_causal_prefix",
    "gma_causal_prefix_backward",
    "gma_causal_streaming",
    "gma_causal_streaming_backward",
    "gma_cross",
    "gma_cross_backward",
    "gma_layer",
    "gma_layer_backward",
    "gma_materialized",
    "gma_materialized_backward",
    "init_layer_params",
    "initial_causal_state",
    "log_gaussian_density",
    "log_priors_from_logits",
    "log_priors_from_logits_backward",
    "log_softmax_backward",
    "memory_slots",
    "omega_from_variances",
    "priors_from_logits",
    "query_mass",
    "read_memory",
    "read_memory_backward",
    "read_weights",
    "responsibilities",
    "responsibilities_backward",
    "scores",
    "scores_backward",
    "sigmoid",
    "softmax_backward",
    "variances_from_omega",
    "variances_from_omega_backward",
    "write_memory",
    "write_memory_backward",
]
