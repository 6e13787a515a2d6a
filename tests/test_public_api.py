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
