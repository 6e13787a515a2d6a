"""Modules the tests import; none of them is a test. Implementations are named by ``module:function`` strings
(``tests.support.planted_impls:StrictCausalMask``) where the oracle imports them, also in its worker processes.

Helpers
    ``_helpers``
        Move arrays between array namespaces and compare them (``to_numpy``, ``from_numpy``, ``rel_err``).
    ``oracle_helpers``
        Shared by the oracle's tests: a function with a declaration attached, the float32 NumPy kernel,
        the routed mass of a case.
    ``_cdp``
        A minimal headless-Chromium driver over the DevTools protocol, for the documentation site's tests.

Exact references
    ``exact_by_differentiation``
        GMA's values in exact arithmetic, gradients by differentiating them with no derivative formula:
        the read/write core in rational arithmetic with forward-mode dual numbers, and the full pipeline
        and the layer in mpmath (100 digits) with central differences.
    ``exact_by_equations``
        GMA forward and backward by the paper's equations, in mpmath (60 digits), naive loops over one
        oracle case's arrays: says whether a float64 figure is the kernel's error or the reference's.

Implementations for the oracle
    ``planted_impls``
        Plausible kernel bugs and correct rewrites (NumPy, PyTorch; layer bugs), a constrained kernel.
    ``planted_causes``
        Kernels with a recognisable failure pattern, for the report's likely-cause hints.
    ``planted_long``
        Long-sequence bugs (each overriding one step of ``LongKernel``) and a chunked PyTorch GMA.
    ``planted_tiling``
        Kernels wrong only where real GPU kernels tile, loop or take a parameter.
    ``scaling_impls``
        Numerically correct causal kernels whose memory is not O(NK).
    ``adversarial_impls``
        Kernels that try to forge, crash or lose the oracle's verdict.
    ``jax_gma``
        An independent JAX GMA, written from the paper, for the oracle's JAX tests.
"""
