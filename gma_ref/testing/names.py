"""The oracle's vocabulary, defined once: calling conventions, variants, dtypes, modes, namespaces.

This is the bottom layer of :mod:`gma_ref.testing`; every other module of the oracle takes
these names from here (and re-exports some for compatibility). It imports nothing.

The package's folders are its layers, bottom to top; each module imports only from modules below
it, and no folder from one above it (``tests/testing/test_import_layers.py`` enforces the order)::

    names, declaration       the vocabulary (this module); what a kernel declares
    cases/                   what is checked
        covering, tails      pairwise (covering) arrays of case axes; sizes leaving every tail after a tile
        sets                 the short and layer cases, the default set
        power                the default set's detection power against the fault model (its counts)
    calling/                 how a candidate is called
        capture, buffers,    capturing what a call prints; arrays as plain bytes; probing a framework's
        probes               arithmetic
        adapters, calls      framework conversion and VJP adapters; one guarded call of the candidate
        wire                 the messages between the oracle and its worker
        worker, isolation    the worker process (the candidate's side); the oracle's handle on it
    core/                    judging one case
        conditioning         the condition factors κ and λ
        reference            the float64 reference of a short or layer case (the reader's functions only)
        compare              the metric and the tolerances
        long, diagnosis,     long cases and their O(N)-memory reference; likely causes of a failing report;
        html_report          the report as an HTML page
        report               CheckResult, Skip, Report
        case_runner          checking one case (an outcome, or "not checkable")
    harness/                 running a whole check
        options              check's options grouped: which cases (CaseSet), how the run goes (RunOptions)
        repro, assertions,   shrinking and case files; assert_gma_close; the complexity check; declared
        scaling, declared,   properties confirmed (a fixed ε); where a candidate passed as an object runs (a
        placement, bounds    worker process whenever it can); when a run stops (a repeated hang or crash,
                             its budget)
        explore              the search beyond the case set (hypothesis, imported when a search runs)
        runner               check, assert_conforms
        pytest_plugin,       the pytest plugin (one test item per case); workarounds for Triton's CPU
        triton_interpreter   interpreter (it imports nothing of the package)

Apart from the harness stands ``calibration/``: the known-good kernels (``emulated``,
``emulated_layer``, ``emulated_long``, ``rounding_family``), which import only ``names``,
``declaration`` and each other, and ``measure``, which runs them to calibrate the tolerances.
Nothing a candidate's check runs imports it.
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
#: Input regimes of the short cases (see :mod:`gma_ref.testing.cases.sets`).
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
