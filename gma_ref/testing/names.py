"""The oracle's vocabulary, defined once: calling conventions, variants, dtypes, modes, namespaces.

This is the bottom layer of :mod:`gma_ref.testing`; every other module of the oracle takes
these names from here (and re-exports some for compatibility). It imports nothing.

The layers, bottom to top (each module imports only from layers below it; the test
``tests/testing/test_import_layers.py`` enforces the order)::

    names                          the vocabulary (this module)
    declaration, capture, buffers, what a kernel declares; capturing what it prints; arrays as plain bytes;
    covering, tails, probes        pairwise (covering) arrays of case axes; sizes leaving every tail after a
                                   tile; probing a framework's arithmetic
    adapters, calls                framework conversion and VJP adapters; one guarded call of the candidate
    cases, wire                    short and layer cases; the messages between the oracle and its worker
    power                          the default set's detection power against the fault model (its counts)
    conditioning, isolation,       the condition factors κ and λ; the oracle's handle on the worker
    worker                         process; the worker process itself (the candidate's side)
    reference                      the float64 reference of a short or layer case
    compare                        the metric and the tolerances
    long, diagnosis, html_report   long cases and their O(N)-memory reference; likely causes of a failing report;
                                   the report as an HTML page
    report                         CheckResult, Skip, Report
    case_runner                    checking one case (an outcome, or "not checkable")
    repro, calibration, assertions shrinking and case files; calibration; assert_gma_close;
    scaling, declared, placement,  the complexity check; declared properties confirmed (a fixed ε); where a
    bounds                         candidate passed as an object runs (a worker process whenever it can); when
                                   a run stops (a repeated hang or crash, its budget)
    explore                        the search beyond the case set (hypothesis, imported when a search runs)
    runner                         check, assert_conforms
    pytest_plugin                  the pytest plugin (one test item per case)

``triton_interpreter`` (workarounds for Triton's CPU interpreter) imports nothing of the package.

Apart from the harness stand the known-good kernels (``emulated``, ``emulated_layer``,
``emulated_long``, ``rounding_family``), which import only ``names``, ``declaration`` and each other.
"""

from __future__ import annotations

__all__ = [
    "INPUT_NAMES",
    "GRAD_NAMES",
    "LAYER_INPUT_NAMES",
    "LAYER_GRAD_NAMES",
    "GATED_LAYER_INPUT_NAMES",
    "GATED_LAYER_GRAD_NAMES",
    "GATES",
    "layer_input_names",
    "VARIANTS",
    "DTYPES",
    "REGIMES",
    "LAYER_REGIMES",
    "MODES",
    "NAMESPACES",
    "DEVICES",
]

#: Argument names of the attention calling convention, in order.
INPUT_NAMES: tuple[str, ...] = ("q", "k", "v", "means", "omega", "prior_logits")
#: Gradient names returned by a VJP (``d_`` + input name).
GRAD_NAMES: tuple[str, ...] = tuple("d_" + n for n in INPUT_NAMES)
#: Argument names of the layer calling convention, in order (``y`` is ``None`` for self-attention).
LAYER_INPUT_NAMES: tuple[str, ...] = ("x", "y", "w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits")
#: Gradient names returned by a layer VJP (``d_y`` only for cross-attention).
LAYER_GRAD_NAMES: tuple[str, ...] = tuple("d_" + n for n in LAYER_INPUT_NAMES)
#: Argument names of a *gated* layer: the layer's, then the gate's weight and bias
#: (docs/oracle/layer-mode.md, "Gated layers").
GATED_LAYER_INPUT_NAMES: tuple[str, ...] = (*LAYER_INPUT_NAMES, "gate_w", "gate_b")
#: Gradient names returned by a gated layer's VJP.
GATED_LAYER_GRAD_NAMES: tuple[str, ...] = tuple("d_" + n for n in GATED_LAYER_INPUT_NAMES)
#: The output gates a layer may declare (``None``: ungated); as :data:`gma_ref.layer.GATES`.
GATES: tuple[str | None, ...] = (None, "elementwise", "headwise")


def layer_input_names(gate: str | None) -> tuple[str, ...]:
    """The layer calling convention's argument names for ``gate`` (one of :data:`GATES`)."""
    return LAYER_INPUT_NAMES if gate is None else GATED_LAYER_INPUT_NAMES


#: The three variants of GMA the oracle knows.
VARIANTS: tuple[str, ...] = ("bidirectional", "causal", "cross")
#: Dtype names the oracle calibrates (``float64`` is the strictest mode).
DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
#: Input regimes of the short cases (see :mod:`gma_ref.testing.cases`).
REGIMES: tuple[str, ...] = ("normal", "far", "floor", "tiny_eps", "tiny_grad", "apart")
#: Regimes of layer cases (``floor`` needs routing vectors placed within ~ε_σ of a mean, which projections of
#: shared tokens cannot do for every head at once; the attention mode covers it).
LAYER_REGIMES: tuple[str, ...] = ("normal", "far", "tiny_eps")
#: What an implementation computes: one GMA (``'attention'``) or the multi-head layer (``'layer'``).
MODES: tuple[str, ...] = ("attention", "layer")
#: Kinds of arrays an implementation may take.
NAMESPACES: tuple[str, ...] = ("numpy", "torch", "jax", "cupy")
#: Devices the oracle compares on.
DEVICES: tuple[str, ...] = ("cpu", "cuda")
