"""Conformance harness: check any GMA implementation against the float64 reference.

Quick use (see docs/oracle.md)::

    from gma_ref.testing import Declaration, check

    def my_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        ...                       # arrays of your framework in, one array out
    my_gma.gma_declaration = Declaration(namespace="torch", dtypes=("float32", "bfloat16"), grad=True)

    report = check(my_gma)        # default cases: bidirectional + causal + cross, forward + gradients
    print(report.format())
    assert report.passed

or from the shell: ``gma-ref check mypkg.mymod:my_gma --dtype float32 --grad``.

Pieces: :mod:`~gma_ref.testing.cases` (seeded case generator),
:mod:`~gma_ref.testing.reference` (float64 reference, condition factor κ,
cancellation-free scales), :mod:`~gma_ref.testing.compare` (metric and the
calibrated tolerances), :mod:`~gma_ref.testing.adapters` (declarations,
framework conversion by DLPack, PyTorch/JAX VJP adapters),
:mod:`~gma_ref.testing.runner` (:func:`check` and the report),
:mod:`~gma_ref.testing.emulated` (a correct NumPy kernel with low-precision
storage), :mod:`~gma_ref.testing.emulated_layer` (the same for the
multi-head layer), :mod:`~gma_ref.testing.calibration` (regenerate the
tolerance table), :mod:`~gma_ref.testing.repro` (shrink a failing case and write
it as a self-contained reproducer; ``check(..., repro=dir)``, ``check(..., case_file=path)``),
:mod:`~gma_ref.testing.capture` (what the implementation prints, kept out of the report).
Layer mode — the multi-head layer with its projections,
``impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma)``
— is selected by ``Declaration(mode="layer")`` or ``check(..., mode="layer")``.
Importing this package does not import torch, jax or cupy.
"""

from .adapters import MODES, Declaration, jax_vjp, torch_autograd
from .assertions import assert_gma_close
from .calibration import calibrate
from .cases import (
    DTYPES,
    LAYER_REGIMES,
    REGIMES,
    VARIANTS,
    Case,
    case_arrays,
    default_cases,
    default_layer_cases,
    generate_cases,
    generate_layer_cases,
    layer_case_arrays,
)
from .compare import LAYER_TOLERANCES, TOLERANCES, UNIT_ROUNDOFF, Comparison, Tolerance, compare_tensor, unit_scale
from .emulated import NumpyKernel, round_to
from .emulated_layer import NumpyLayer
from .reference import (
    GRAD_NAMES,
    INPUT_NAMES,
    LAYER_GRAD_NAMES,
    LAYER_INPUT_NAMES,
    Reference,
    layer_reference,
    reference,
)
from .repro import CaseFile, load_case_file
from .runner import CheckResult, Interrupted, Report, Skip, assert_conforms, check, run_case

__all__ = [
    "DTYPES",
    "GRAD_NAMES",
    "INPUT_NAMES",
    "LAYER_GRAD_NAMES",
    "LAYER_INPUT_NAMES",
    "LAYER_REGIMES",
    "LAYER_TOLERANCES",
    "MODES",
    "REGIMES",
    "TOLERANCES",
    "UNIT_ROUNDOFF",
    "VARIANTS",
    "Case",
    "CaseFile",
    "CheckResult",
    "Comparison",
    "Declaration",
    "Interrupted",
    "NumpyKernel",
    "NumpyLayer",
    "Reference",
    "Report",
    "Skip",
    "Tolerance",
    "assert_conforms",
    "assert_gma_close",
    "calibrate",
    "case_arrays",
    "check",
    "compare_tensor",
    "default_cases",
    "default_layer_cases",
    "generate_cases",
    "generate_layer_cases",
    "jax_vjp",
    "layer_case_arrays",
    "layer_reference",
    "load_case_file",
    "reference",
    "round_to",
    "run_case",
    "torch_autograd",
    "unit_scale",
]
