"""The oracle: check any GMA implementation against the float64 reference.

Quick use (see docs/kernel-authors.md, and the reference in docs/oracle/)::

    from gma_ref.testing import Declaration, check

    def my_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        ...                       # arrays of your framework in, one array out
    my_gma.gma_declaration = Declaration(namespace="torch", dtypes=("float32", "bfloat16"), grad=True)

    report = check(my_gma)        # default cases: bidirectional + causal + cross, forward + gradients
    print(report.format())
    assert report.passed

or from the shell: ``gma-ref check mypkg.mymod:my_gma --dtype float32 --grad``.

The package is built in layers, each importing only from those below it (the order is in
:mod:`~gma_ref.testing.names`): the vocabulary (:mod:`~gma_ref.testing.names`) and what a kernel
declares (:mod:`~gma_ref.testing.declaration`); framework conversion and VJP adapters
(:mod:`~gma_ref.testing.adapters`) and one guarded call of the candidate
(:mod:`~gma_ref.testing.calls`); the seeded cases (:mod:`~gma_ref.testing.cases`); the condition
factors (:mod:`~gma_ref.testing.conditioning`), the float64 reference
(:mod:`~gma_ref.testing.reference`), the metric and tolerances (:mod:`~gma_ref.testing.compare`) and
the long-sequence cases and reference (:mod:`~gma_ref.testing.long`); the verdict
(:mod:`~gma_ref.testing.report`); checking one case (:mod:`~gma_ref.testing.case_runner`);
reproducers (:mod:`~gma_ref.testing.repro`) and calibration (:mod:`~gma_ref.testing.calibration`);
and :func:`check` (:mod:`~gma_ref.testing.runner`). The known-good kernels the oracle is
calibrated with stand apart: :mod:`~gma_ref.testing.emulated`, :mod:`~gma_ref.testing.emulated_layer`,
:mod:`~gma_ref.testing.emulated_long`, :mod:`~gma_ref.testing.rounding_family`.
Layer mode — the multi-head layer with its projections,
``impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma)``
— is selected by ``Declaration(mode="layer")`` or ``check(..., mode="layer")``.
Importing this package does not import torch, jax or cupy.
"""

from .adapters import jax_vjp, torch_autograd
from .assertions import assert_gma_close
from .case_runner import CaseOutcome, NotCheckable, evaluate_case
from .cases import Case, default_cases, default_layer_cases, generate_cases, generate_layer_cases
from .declaration import Declaration
from .report import CheckResult, Interrupted, Report, Skip
from .repro import CaseFile, load_case_file
from .runner import assert_conforms, check

__all__ = [
    "Case",
    "CaseFile",
    "CaseOutcome",
    "CheckResult",
    "Declaration",
    "Interrupted",
    "NotCheckable",
    "Report",
    "Skip",
    "assert_conforms",
    "assert_gma_close",
    "check",
    "default_cases",
    "default_layer_cases",
    "evaluate_case",
    "generate_cases",
    "generate_layer_cases",
    "jax_vjp",
    "load_case_file",
    "torch_autograd",
]
