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

The options say what is checked (``dtype=``, ``variants=``, ``grad=`` …), which cases (``cases=``: a list
of :class:`Case`, or a :class:`CaseSet` such as ``CaseSet(n_generated=20, seed=3)``) and how the run goes
(``run=RunOptions(timeout=60, budget=600)``)::

    check(my_gma, dtype="float32", cases=CaseSet(scale="long"), run=RunOptions(keep_going=True))

The package's folders are its layers, each importing only from those below it (the order is in
:mod:`~gma_ref.testing.names`): the vocabulary (:mod:`~gma_ref.testing.names`) and what a kernel
declares (:mod:`~gma_ref.testing.declaration`); what is checked (:mod:`gma_ref.testing.cases`); how a
candidate is called (:mod:`gma_ref.testing.calling`); judging one case — the float64 reference, the
metric, the verdict (:mod:`gma_ref.testing.core`); running a whole check (:mod:`gma_ref.testing.harness`).
The known-good kernels the tolerances were calibrated on stand apart, in :mod:`gma_ref.testing.calibration`.
Layer mode — the multi-head layer with its projections,
``impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma)``
— is selected by ``Declaration(mode="layer")`` or ``check(..., mode="layer")``.
Importing this package does not import torch, jax or cupy.
"""

from .calling.adapters import jax_vjp, torch_autograd
from .cases.sets import Case, default_cases, default_layer_cases, generate_cases, generate_layer_cases
from .core.case_runner import CaseOutcome, NotCheckable, evaluate_case
from .core.report import CheckResult, Interrupted, Report, Skip
from .declaration import Declaration
from .harness.assertions import assert_gma_close
from .harness.options import CaseSet, RunOptions
from .harness.repro import CaseFile, load_case_file
from .harness.runner import assert_conforms, check

__all__ = [
    "Case",
    "CaseFile",
    "CaseSet",
    "CaseOutcome",
    "CheckResult",
    "Declaration",
    "Interrupted",
    "NotCheckable",
    "Report",
    "RunOptions",
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
