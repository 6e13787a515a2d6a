"""The public surface is unambiguous: no module shares a name with a public function.

Every name in ``gma_ref.__all__`` resolves to what it says, even after every submodule has been
imported (importing a submodule binds its name on the package, which would shadow a function of
the same name).
"""

from __future__ import annotations

import importlib
import pkgutil
import types

import numpy as np
import pytest

import gma_ref


def _import_every_submodule() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(gma_ref.__path__, prefix="gma_ref."):
        importlib.import_module(info.name)
        names.append(info.name.rsplit(".", 1)[-1])
    return names


def test_no_public_name_is_a_module_after_importing_every_submodule() -> None:
    _import_every_submodule()
    modules = [name for name in gma_ref.__all__ if isinstance(getattr(gma_ref, name), types.ModuleType)]
    assert modules == []


def test_no_submodule_is_named_like_a_public_function() -> None:
    clashes = sorted(set(_import_every_submodule()) & set(gma_ref.__all__))
    assert clashes == []


def test_responsibilities_and_affinity_are_callable_from_the_package() -> None:
    import gma_ref.induced  # noqa: F401  (binding the submodules must not shadow anything)
    import gma_ref.posterior  # noqa: F401

    x = np.array([[0.0, 1.0], [2.0, -1.0]])
    means = np.array([[0.0, 0.0], [1.0, 1.0]])
    gamma = gma_ref.responsibilities(x, means, np.ones((2, 2)), np.log(np.full(2, 0.5)))
    np.testing.assert_allclose(np.sum(gamma, axis=-1), 1.0, rtol=0, atol=1e-15)
    a_tilde = gma_ref.affinity(gamma, gamma)
    assert a_tilde.shape == (2, 2)


#: The package's surface, pinned: what a reader of the paper needs (the rest lives in its module).
PACKAGE_SURFACE = {
    "DEFAULT_EPS", "DEFAULT_EPS_SIGMA", "DEFAULT_MAX_BYTES",
    "AttentionGrad", "AttentionSaved", "CausalState", "GMAGrad", "GMALayerParams", "LayerGrad",
    "variances_from_omega", "log_priors_from_logits", "scores", "responsibilities",
    "write_memory", "read_memory", "gma_bidirectional", "gma_bidirectional_backward",
    "affinity", "attention_weights", "gma_materialized",
    "gma_causal_prefix", "gma_causal_streaming", "gma_causal_chunked",
    "gma_attention", "gma_attention_backward", "gma_layer", "gma_layer_backward", "init_layer_params",
}
#: The oracle's surface, pinned: what a kernel author calls.
ORACLE_SURFACE = {
    "Declaration", "check", "assert_conforms", "assert_gma_close", "Report", "CheckResult", "Skip", "Interrupted",
    "evaluate_case", "CaseOutcome", "NotCheckable", "Case", "default_cases", "default_layer_cases",
    "generate_cases", "generate_layer_cases", "load_case_file", "CaseFile", "torch_autograd", "jax_vjp",
    "CaseSet", "RunOptions",
}


def test_the_package_surface_is_pinned() -> None:
    """gma_ref.__all__ is exactly the pinned list; each name resolves without a warning."""
    import warnings

    assert set(gma_ref.__all__) == PACKAGE_SURFACE and len(gma_ref.__all__) == len(PACKAGE_SURFACE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in gma_ref.__all__:
            getattr(gma_ref, name)


def test_the_oracle_surface_is_pinned() -> None:
    """gma_ref.testing.__all__ is exactly the pinned list; each name resolves without a warning."""
    import warnings

    import gma_ref.testing as oracle

    assert set(oracle.__all__) == ORACLE_SURFACE and len(oracle.__all__) == len(ORACLE_SURFACE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in oracle.__all__:
            getattr(oracle, name)


#: Names exported by a package surface during development that now live only in their module: the first
#: release has no deprecation layer, so each is an AttributeError on the package (import it from its module).
FORMER_NAMES: dict[str, tuple[str, ...]] = {
    "gma_ref": ("AttentionResiduals", "FORMS", "ReadGrad", "ScoresGrad", "causal_step", "gma_cross",
                "gma_causal_prefix_backward", "initial_causal_state", "log_gaussian_density",
                "log_softmax_backward", "memory_slots", "read_weights", "responsibilities_backward",
                "scores_backward", "sigmoid", "softmax_backward", "write_memory_backward"),
    "gma_ref.testing": ("DTYPES", "INPUT_NAMES", "TOLERANCES", "Comparison", "NumpyKernel", "Reference",
                        "Tolerance", "calibrate", "case_arrays", "compare_tensor", "layer_reference"),
    "gma_ref.attention": ("AttentionResiduals",),
    "gma_ref.posterior": ("softmax_backward", "log_softmax_backward"),
}


@pytest.mark.parametrize("package", sorted(FORMER_NAMES))
def test_a_former_name_is_an_attribute_error_with_no_warning(package: str) -> None:
    """No surface keeps a name it no longer exports: each former name (gma_ref.scores_backward,
    gma_ref.attention.AttentionResiduals, …) raises AttributeError at once, with no DeprecationWarning,
    and no package carries a table of moved names."""
    import warnings

    pkg = importlib.import_module(package)
    assert not hasattr(pkg, "_MOVED")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in (*FORMER_NAMES[package], "no_such_name"):
            assert name not in getattr(pkg, "__all__", ())
            with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute '{name}'"):
                getattr(pkg, name)


def test_there_is_no_deprecation_layer() -> None:
    """The compatibility module is gone and no module of the package issues a DeprecationWarning."""
    import pathlib

    root = pathlib.Path(importlib.import_module("gma_ref").__file__).parent
    assert not (root / "_compat.py").exists()
    offenders = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
                 if "DeprecationWarning" in p.read_text(encoding="utf-8")]
    assert offenders == []
